# Ferry: the two commands a newcomer needs are `make run` and `make test`.
SWIFT ?= swift
DATA ?= ferry-data

.PHONY: all deps build run test bench clean help

all: build

help:
	@echo "make run    build and start Ferry on ./$(DATA)"
	@echo "make test   run every test"
	@echo "make bench  release-build and run the benchmarks"

deps:
	@scripts/install-deps.sh

build: deps
	$(SWIFT) build

# Starts a peer on ./ferry-data: the TLS WebSocket listener on port $(PORT), with a
# generated identity. It prints its node ID and how another node can connect.
PORT ?= 4985
run: build
	.build/debug/ferry serve --data $(DATA) --port $(PORT)

test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test

bench: deps
	$(SWIFT) build -c release
	.build/release/ferry-bench store
	.build/release/ferry-bench sync
	.build/release/ferry-bench net

clean:
	$(SWIFT) package clean
