package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"slices"
	"time"
)

// TarGz returns the bundle's files as a reproducible .tar.gz: one regular
// file entry per file, in path order, each with mode 0644, uid and gid 0,
// no user or group names and a modification time of 0 (1970-01-01), and no
// directory entries; the gzip header carries no name and a zero mtime.
// [LoadTarGz] of the result yields a bundle with the same [Digest].
//
// The same files give the same bytes with the same Go release; the
// compressor's output may differ between releases, the digest never does.
func (b *Bundle) TarGz() ([]byte, error) {
	paths := make([]string, 0, len(b.Files))
	for p := range b.Files {
		if err := checkPath(p); err != nil {
			return nil, &Error{File: p, Err: err}
		}
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: tar.gz: %w", b.Manifest.Name, err)
	}
	tw := tar.NewWriter(zw)
	epoch := time.Unix(0, 0)
	for _, p := range paths {
		content := b.Files[p]
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     p,
			Mode:     0o644,
			Size:     int64(len(content)),
			ModTime:  epoch,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("bundle %s: tar.gz: %s: %w", b.Manifest.Name, p, err)
		}
		if _, err := tw.Write(content); err != nil {
			return nil, fmt.Errorf("bundle %s: tar.gz: %s: %w", b.Manifest.Name, p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("bundle %s: tar.gz: %w", b.Manifest.Name, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("bundle %s: tar.gz: %w", b.Manifest.Name, err)
	}
	return buf.Bytes(), nil
}
