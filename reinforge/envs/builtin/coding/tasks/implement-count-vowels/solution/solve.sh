#!/bin/bash
set -e
cd /app
sed -i 's/raise NotImplementedError/return sum(1 for ch in text if ch in "aeiouAEIOU")/' vowels.py
