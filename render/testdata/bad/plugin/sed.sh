#!/bin/sh
touch /tmp/capstan-render-plugin-ran
cat
