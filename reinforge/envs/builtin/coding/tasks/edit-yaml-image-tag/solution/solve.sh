#!/bin/bash
set -e
cd /app
sed -i 's/image: redis:6/image: redis:7/' compose.yaml
