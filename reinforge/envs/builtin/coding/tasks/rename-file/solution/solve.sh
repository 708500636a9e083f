#!/bin/bash
set -e
cd /app
mv report.txt report.md
