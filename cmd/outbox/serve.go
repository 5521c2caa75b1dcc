package main

import "context"

func (a *app) serve(ctx context.Context, args []string) error { return usagef("serve: not yet") }
