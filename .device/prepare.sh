#!/usr/bin/env bash
# Run here, before asking for a lent GPU machine: copies the pure-Python packages `codesign.execute` needs and the
# device image lacks (hydra-core, omegaconf and antlr4's runtime: the image has JAX with CUDA, numpy and PyYAML, and
# nothing can be installed there) from this checkout's .venv into .device/vendor (git-ignored), which the device
# tool's `run` then carries. Prints the `run` call that does the check (.device/check.sh).
set -eu
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .device/vendor && mkdir -p .device/vendor
for pkg in hydra omegaconf antlr4; do
  [ -d "$site/$pkg" ] || { echo "prepare.sh: $pkg is not installed in .venv ($site); run pip install -e '.[test]' first" >&2; exit 1; }
  cp -r "$site/$pkg" .device/vendor/
done
find .device/vendor -name __pycache__ -prune -exec rm -rf {} +
echo "vendored into .device/vendor: $(du -sh .device/vendor | cut -f1)"
echo 'device run: carry [".device/vendor"], timeout_s 540, command "bash .device/check.sh"'
