#!/bin/bash
set -e
cd /app
sed -i '/"legacy_mode"/d' preferences.json
