package kernel

import (
	"context"
	"errors"
	"fmt"
)

// CopyMarkKey is the default tenant's counter in which `wicket store copy`
// marks the store it fills: CopyMarkIncomplete from before its first
// record until the copy is verified, then a line saying what it was copied
// from. Start refuses a store whose copy never finished: records may be
// missing from it, and nothing else would tell.
const CopyMarkKey = "wicket.store_copy"

// CopyMarkIncomplete is CopyMarkKey's value while a copy is unfinished.
const CopyMarkIncomplete = "incomplete"

// checkCopyMark refuses a store that an unfinished copy filled.
func (k *Kernel) checkCopyMark(ctx context.Context) error {
	var mark []byte
	err := k.store.View(ctx, func(tx ReadTx) error {
		v, err := tx.Counter(DefaultTenant, CopyMarkKey)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		mark = v
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the store copy mark: %w", err)
	}
	if string(mark) == CopyMarkIncomplete {
		return errors.New("this store was being filled by `wicket store copy`, which stopped before it verified the copy: records may be missing; copy again into an empty store (the source is as it was)")
	}
	return nil
}
