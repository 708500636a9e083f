#!/bin/bash
set -e
cd /app
sed -i 's/print(sum(prices))/return sum(prices)/' totals.py
