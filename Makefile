# sandkeep — developer entry points. The test command is scripts/test.sh (CI runs it via .ci/run).

GO       ?= go
BIN      ?= bin
FUZZTIME ?= 20s
PKGS     ?= ./...

.PHONY: all build image test fuzz clean

all: build

# The CLI, and the in-sandbox agent: static (CGO_ENABLED=0), as it runs inside FROM scratch images.
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/sandkeep ./cmd/sandkeep
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/sandkeep-agent ./cmd/sandkeep-agent

# The default runnable sandbox image, sandkeep-busybox:latest, built locally without pulls.
image:
	bash scripts/build-image.sh

test:
	bash scripts/test.sh

# Every Fuzz target in every package, each for FUZZTIME (go test -fuzz accepts one target at a time).
fuzz:
	@set -e; \
	for pkg in $$($(GO) list $(PKGS)); do \
		list=$$($(GO) test -list '^Fuzz' $$pkg) || { echo "$$list"; exit 1; }; \
		for target in $$(printf '%s\n' "$$list" | grep '^Fuzz' || true); do \
			echo "==> fuzz $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

clean:
	rm -rf $(BIN)
	rm -f *.test *.out coverage.* cover.out
