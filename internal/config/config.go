// Package config holds what the configs of the relay, the consumer and the transports share:
// filling in documented defaults. For contributors; not part of the public API.
package config

// Default sets *field to def when it holds its type's zero value, which every config of
// the library reads as "not set".
func Default[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}
