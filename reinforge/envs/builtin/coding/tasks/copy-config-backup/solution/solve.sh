#!/bin/bash
set -e
cd /app
cp nginx.conf nginx.conf.bak
