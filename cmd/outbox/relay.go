package main

import "context"

func (a *app) relay(ctx context.Context, args []string) error { return usagef("relay: not yet") }
