#!/bin/bash
set -e
cd /app
printf 'print("Hello, world!")\n' > hello.py
