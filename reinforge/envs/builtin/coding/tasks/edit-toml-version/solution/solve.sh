#!/bin/bash
set -e
cd /app
sed -i 's/version = "0.1.0"/version = "0.2.0"/' pyproject.toml
