#!/usr/bin/env bash
# Lints deployments/container/Dockerfile:
#   - hadolint, when it is installed (it is not packaged for Debian 12 nor
#     go-installable; get it from https://github.com/hadolint/hadolint),
#   - BuildKit's build checks (the rules of `docker build --check`), always:
#     hack/dockerfile-lint, built from the Go module proxy, no daemon needed.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERFILE="${1:-deployments/container/Dockerfile}"
rc=0
if command -v hadolint >/dev/null 2>&1; then
  echo "== hadolint $DOCKERFILE"
  hadolint "$DOCKERFILE" || rc=1
else
  echo "== hadolint: not installed, skipped"
fi
echo "== BuildKit build checks $DOCKERFILE"
go -C hack/dockerfile-lint run . "$PWD/$DOCKERFILE" || rc=1
exit "$rc"
