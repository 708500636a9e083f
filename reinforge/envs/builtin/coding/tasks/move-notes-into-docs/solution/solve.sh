#!/bin/bash
set -e
cd /app
mkdir -p docs
mv notes.md docs/
