#!/bin/bash
set -e
cd /app
sed -i '1i import math' geometry2d.py
