#!/bin/bash
set -e
cd /app
sed -i 's/^replicas: 1$/replicas: 3/' deploy.yaml
