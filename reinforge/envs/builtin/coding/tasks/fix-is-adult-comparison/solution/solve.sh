#!/bin/bash
set -e
cd /app
sed -i 's/age > 18/age >= 18/' age.py
