#!/bin/bash
set -e
cd /app
sed -i 's/Welcom, /Welcome, /' messages.py
