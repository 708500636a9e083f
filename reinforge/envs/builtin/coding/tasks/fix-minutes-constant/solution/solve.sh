#!/bin/bash
set -e
cd /app
sed -i 's/minutes \* 100/minutes * 60/' timeunits.py
