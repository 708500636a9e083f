#!/bin/bash
set -e
cd /app
echo 'DB_NAME=shop' >> local.env
