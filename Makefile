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

# Until the network layer lands, the peer is a long-running store process that
# prints every change committed to ./ferry-data (ferry watch).
run: build
	.build/debug/ferry watch --data $(DATA)

test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test

bench: deps
	$(SWIFT) build -c release --product ferry-bench
	.build/release/ferry-bench store
	.build/release/ferry-bench sync

clean:
	$(SWIFT) package clean
