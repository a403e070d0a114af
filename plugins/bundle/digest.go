package bundle

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
)

// Digest returns the content digest of a bundle's files: the lowercase hex
// SHA-256 of
//
//	for each path p of files, sorted by its bytes (Go string order):
//	    decimal(len(p)) ":" p decimal(len(content)) ":" content
//
// where len counts bytes and decimal is the base-10 ASCII form without
// leading zeros. This is the same length-prefix encoding as step ids
// (docs/identity.md), so no two different file sets hash the same input.
//
// Every file counts, bundle.yaml and tests included, byte for byte as
// stored: nothing (not even data.json) is canonicalised first, so
// reformatting a file changes the digest. Archive metadata (entry order,
// modes, times, owners, compression) does not count, so a directory, its
// .tar.gz and [Bundle.TarGz]'s output all have the same digest.
func Digest(files map[string][]byte) string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	h := sha256.New()
	var num [20]byte
	for _, p := range paths {
		c := files[p]
		h.Write(strconv.AppendInt(num[:0], int64(len(p)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(p))
		h.Write(strconv.AppendInt(num[:0], int64(len(c)), 10))
		h.Write([]byte{':'})
		h.Write(c)
	}
	return hex.EncodeToString(h.Sum(nil))
}
