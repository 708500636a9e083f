#!/bin/bash
set -e
cd /app
sed -i 's|raise NotImplementedError|return celsius * 9 / 5 + 32|' temperature.py
