#!/bin/bash
set -e
cd /app
sed -i 's/raise NotImplementedError/return "Hi, " + name + "!"/' greeter.py
