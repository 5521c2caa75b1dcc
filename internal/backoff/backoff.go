// Package backoff is the exponential backoff with jitter that the relay and the consumer
// wait by: between a message's retries, and while a broker or database is unavailable.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the delay before attempt+1: base doubled per attempt, capped at max, with
// "equal jitter" (a random point in the upper half) so retries of one outage spread out.
func Delay(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}
