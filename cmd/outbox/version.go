package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionInfo is what "outbox version" prints: the module version "go install …@v0.3.0"
// built ("(devel)" from a checkout), the commit when the build recorded one, and Go's.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

func readVersion() versionInfo {
	v := versionInfo{Version: "(unknown)", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (a *app) version(_ context.Context, args []string) error {
	fs := a.flags("version", "[--json]")
	asJSON := fs.Bool("json", false, "print the version as JSON")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	v := readVersion()
	if *asJSON {
		return printJSON(a.stdout, v)
	}
	fmt.Fprintf(a.stdout, "outbox %s", v.Version)
	if v.Commit != "" {
		c := v.Commit[:min(12, len(v.Commit))]
		if v.Modified {
			c += "+modified"
		}
		fmt.Fprintf(a.stdout, " (%s)", c)
	}
	fmt.Fprintf(a.stdout, " %s %s\n", v.Go, v.Platform)
	return nil
}
