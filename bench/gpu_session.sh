#!/usr/bin/env bash
# `bash bench/gpu_session.sh [budget_s [gpu_check args...]]`: kept at its old path; the script is bench/gpu_run/gpu_session.sh.
exec bash "$(dirname "$0")/gpu_run/gpu_session.sh" "$@"
