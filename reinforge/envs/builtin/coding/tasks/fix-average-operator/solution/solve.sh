#!/bin/bash
set -e
cd /app
sed -i 's|(a + b) \* 2|(a + b) / 2|' average.py
