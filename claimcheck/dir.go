package claimcheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// Dir is a [BlobStore] in a directory: one file per blob, written to a temporary file and
// renamed into place, so a reader never sees half a body. It serves tests, single-machine
// deployments and a directory every process mounts (NFS, a shared volume); its references
// are file:// URIs of the directory as NewDir was given it, made absolute.
type Dir struct {
	path string
	ref  string
}

// tmpPrefix starts the names of files being written; List skips them and Sweep leaves
// them alone (a crashed writer's leftovers are the operator's, and are never read).
const tmpPrefix = ".tmp-"

// NewDir returns the store in directory path, creating it (mode 0700) if needed.
func NewDir(path string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("claimcheck: directory %q: %w", path, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("claimcheck: directory %q: %w", path, err)
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs) + "/"}
	return &Dir{path: abs, ref: u.String()}, nil
}

// Put implements [BlobStore].
func (d *Dir) Put(ctx context.Context, key string, body []byte) error {
	if err := d.check(ctx, key); err != nil {
		return err
	}
	suffix := make([]byte, 8)
	_, _ = rand.Read(suffix)
	tmp := filepath.Join(d.path, tmpPrefix+key+"-"+hex.EncodeToString(suffix))
	if err := os.WriteFile(tmp, body, 0o600); err != nil {
		return fmt.Errorf("claimcheck: writing blob %s: %w", key, err)
	}
	if err := os.Rename(tmp, filepath.Join(d.path, key)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("claimcheck: writing blob %s: %w", key, err)
	}
	return nil
}

// Get implements [BlobStore].
func (d *Dir) Get(ctx context.Context, key string) ([]byte, error) {
	if err := d.check(ctx, key); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(d.path, key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, d.Ref(key))
	}
	if err != nil {
		return nil, fmt.Errorf("claimcheck: reading blob %s: %w", key, err)
	}
	return b, nil
}

// Delete implements [BlobStore].
func (d *Dir) Delete(ctx context.Context, key string) error {
	if err := d.check(ctx, key); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(d.path, key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("claimcheck: deleting blob %s: %w", key, err)
	}
	return nil
}

// List implements [BlobStore].
func (d *Dir) List(ctx context.Context, yield func(Blob) bool) error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("claimcheck: listing %s: %w", d.path, err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("claimcheck: listing %s: %w", d.path, err)
		}
		if !yield(Blob{Key: e.Name(), Size: info.Size(), Modified: info.ModTime()}) {
			return nil
		}
	}
	return nil
}

// Ref implements [BlobStore]: file:///the/directory/key.
func (d *Dir) Ref(key string) string { return d.ref + key }

func (d *Dir) check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return ValidKey(key)
}
