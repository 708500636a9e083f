#!/bin/bash
set -e
cd /app
sed -i 's/raise NotImplementedError/return x * x/' square.py
