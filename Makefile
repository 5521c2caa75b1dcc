# make demo | test | bench | services | services-down
# Extra flags for go test: make test ARGS='-run Relay -v'
.PHONY: demo test bench services services-down

demo:
	go run ./examples/quickstart

test:
	scripts/test.sh $(ARGS)

bench:
	scripts/bench.sh $(ARGS)

services:
	scripts/services/up.sh

services-down:
	scripts/services/down.sh
