# Fortis: the two set-up commands of the README.
#   make demo   set up (venv, data, tools) and run the demo evaluation -> demo-out/
#   make test   set up and run the whole test suite
.PHONY: setup demo test lint protos bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/fortis demo --out demo-out

test: setup
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check core infra services adapters server clients/python/fortis tests bench scripts
	.venv/bin/mypy core infra services adapters server clients/python/fortis
	cd protos && ../node_modules/.bin/buf lint

protos:
	.venv/bin/python scripts/gen_protos.py

bench:
	.venv/bin/python bench/proxy.py
