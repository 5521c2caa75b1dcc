// Package brokerfault is what the transports share to mark their SDKs' errors that are the
// broker's fault, not the message's, with [outbox.Unavailable]: each transport decides
// which errors those are, this package applies the decision the same way everywhere.
package brokerfault

import (
	"errors"

	"github.com/txoutbox/outbox"
)

// Mark returns err marked with outbox.Unavailable when isBroker reports it the broker's
// fault, and err as it is otherwise: nil, a permanent error (it stays permanent), an
// error already marked, or the message's own fault.
func Mark(err error, isBroker func(error) bool) error {
	if err == nil || outbox.IsPermanent(err) || errors.Is(err, outbox.ErrUnavailable) || !isBroker(err) {
		return err
	}
	return outbox.Unavailable(err)
}

// IsAny reports whether err is one of targets, as errors.Is says.
func IsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
