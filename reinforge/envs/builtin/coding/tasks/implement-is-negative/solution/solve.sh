#!/bin/bash
set -e
cd /app
sed -i 's/raise NotImplementedError/return n < 0/' sign.py
