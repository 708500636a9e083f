#!/bin/bash
set -e
cd /app
sed -i 's/line-length = 88/line-length = 100/' format.toml
