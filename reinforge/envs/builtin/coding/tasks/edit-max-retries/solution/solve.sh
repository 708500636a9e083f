#!/bin/bash
set -e
cd /app
sed -i 's/MAX_RETRIES = 3/MAX_RETRIES = 5/' settings.py
