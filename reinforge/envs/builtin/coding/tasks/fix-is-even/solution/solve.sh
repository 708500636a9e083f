#!/bin/bash
set -e
cd /app
sed -i 's/return n % 2 == 1/return n % 2 == 0/' parity.py
