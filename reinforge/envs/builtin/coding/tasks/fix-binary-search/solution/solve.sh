#!/bin/bash
set -e
cd /app
sed -i 's/while low < high:/while low <= high:/' search.py
