#!/bin/bash
set -e
cd /app
sed -i 's/text.split(" ")/text.split()/' wordcount.py
