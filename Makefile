# make demo | test | bench | services | services-down
#   test           the suite; stops on exit the services it started (KEEP_SERVICES=1 keeps them)
#   services       start the services and leave them running (make test then leaves them alone)
#   services-down  stop the services that scripts/services/up.sh started
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
