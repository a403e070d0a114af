package bbolt

import (
	"errors"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// TestDecodeSlotMalformed feeds decodeSlot every shape of damaged slot
// and expects errMalformed, never a panic; and round-trips the good ones.
func TestDecodeSlotMalformed(t *testing.T) {
	occ := encodeOccurrence(kernel.Occurrence{Count: 3})
	for name, b := range map[string][]byte{
		"empty":             nil,
		"no flags":          {0},
		"unknown flag":      {slotStep | 4, 0, 0, 0, 0, 0, 0, 0, 1},
		"short seq":         {slotStep, 0, 0, 1},
		"occ flag, no occ":  {slotOcc},
		"seq then nothing":  {slotStep | slotOcc, 0, 0, 0, 0, 0, 0, 0, 1},
		"bytes left over":   {slotStep, 0, 0, 0, 0, 0, 0, 0, 1, 9},
		"occ only, no data": {slotOcc},
	} {
		if _, err := decodeSlot(b); !errors.Is(err, errMalformed) {
			t.Errorf("%s: decodeSlot(%x) = %v, want errMalformed", name, b, err)
		}
	}
	for _, s := range []slot{
		{seq: 7, hasSeq: true},
		{occ: occ},
		{seq: 1 << 40, hasSeq: true, occ: occ},
	} {
		got, err := decodeSlot(s.encode())
		if err != nil || got.seq != s.seq || got.hasSeq != s.hasSeq || string(got.occ) != string(s.occ) {
			t.Errorf("round trip of %+v: %+v, %v", s, got, err)
		}
		o := kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 2}, Count: 5}
		with, err := decodeSlot(s.encodeWith(o))
		if err != nil || with.seq != s.seq || with.hasSeq != s.hasSeq || string(with.occ) != string(encodeOccurrence(o)) {
			t.Errorf("encodeWith of %+v: %+v, %v", s, with, err)
		}
	}
}

// TestMalformedSlotIsAnError stores a damaged slot and expects every
// reader and writer of it to fail with an error rather than panic or
// read it as absent.
func TestMalformedSlotIsAnError(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, false)
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bSteps).Put(key("t", "e", "s"), []byte{slotStep, 1, 2})
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(t.Context(), func(tx kernel.ReadTx) error {
		if _, err := tx.Step("t", "e", "s"); err == nil || errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("Step over a malformed slot: %v", err)
		}
		if _, err := tx.Occurrence("t", "e", "s"); err == nil {
			t.Error("Occurrence over a malformed slot: no error")
		}
		if _, err := tx.ListSteps("t", "e"); err == nil {
			t.Error("ListSteps over a malformed slot: no error")
		}
		return nil
	})
	err = s.Update(t.Context(), func(tx kernel.Tx) error {
		if err := tx.PutStep(&kernel.Step{ID: "s", ExecutionID: "e", Tenant: "t", Seq: 2}); err == nil {
			t.Error("PutStep over a malformed slot: no error")
		}
		if err := tx.PutOccurrence("t", "e", "s", kernel.Occurrence{Count: 1}); err == nil {
			t.Error("PutOccurrence over a malformed slot: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCheckFindsStepLayoutCorruption damages the schema 6 layout (step
// records in the log, slots, inputs apart) in each way Check knows about.
func TestCheckFindsStepLayoutCorruption(t *testing.T) {
	const id = "01960000-0000-7000-8000-000000000001"
	cases := []struct {
		name    string
		corrupt func(tx *bolt.Tx) error
		want    string
	}{
		{"slot without its record", func(tx *bolt.Tx) error {
			return tx.Bucket(bEvents).Delete(stepLogKey("t", id, 2, "s1"))
		}, "no record at seq 2"},
		{"record without its slot", func(tx *bolt.Tx) error {
			return tx.Bucket(bSteps).Delete(key("t", id, "s1"))
		}, "does not point at it"},
		{"slot pointing elsewhere", func(tx *bolt.Tx) error {
			return tx.Bucket(bSteps).Put(key("t", id, "s1"), slot{seq: 3, hasSeq: true}.encode())
		}, "no record at seq 3"},
		{"malformed slot", func(tx *bolt.Tx) error {
			return tx.Bucket(bSteps).Put(key("t", id, "s9"), []byte{slotOcc | 8})
		}, "malformed"},
		{"malformed counter in a slot", func(tx *bolt.Tx) error {
			return tx.Bucket(bSteps).Put(key("t", id, "s9"), []byte{slotOcc, 0xff})
		}, `entry "s9"`},
		{"record misnamed", func(tx *bolt.Tx) error {
			raw := encodeStepV2(&kernel.Step{ID: "s2", ExecutionID: id, Tenant: "t", Seq: 2}) // format 3 holds no ids
			return tx.Bucket(bEvents).Put(stepLogKey("t", id, 2, "s1"), raw)
		}, "says t/" + id + "/s2"},
		{"orphan input", func(tx *bolt.Tx) error {
			return tx.Bucket(bExecutions).Put(inputKey(key("t", "nope")), []byte(`{}`))
		}, "names no execution"},
		{"input of another tenant's id", func(tx *bolt.Tx) error {
			return tx.Bucket(bExecutions).Put(inputKey(key("u", id)), []byte(`{}`))
		}, "names no execution"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, Options{NoSync: true}, false)
			err := s.Update(t.Context(), func(tx kernel.Tx) error {
				e := &kernel.Execution{ID: id, Tenant: "t", AgentID: "a", LastSeq: 2, Input: []byte(`{"x":1}`)}
				if err := tx.PutExecution(e); err != nil {
					return err
				}
				for _, ev := range []kernel.Event{
					{ExecutionID: id, Seq: 1, Type: kernel.EvExecutionCreated, Payload: []byte(`{}`)},
					{ExecutionID: id, Seq: 2, Type: kernel.EvStepProposed, Payload: []byte(`{"step_id":"s1"}`)},
				} {
					if err := tx.AppendEvent("t", ev); err != nil {
						return err
					}
				}
				if err := tx.PutStep(&kernel.Step{ID: "s1", ExecutionID: id, Tenant: "t", Seq: 2}); err != nil {
					return err
				}
				return tx.PutOccurrence("t", id, "s1", kernel.Occurrence{Count: 1})
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(); err != nil {
				t.Fatalf("Check of a consistent store: %v", err)
			}
			if err := s.db.Update(c.corrupt); err != nil {
				t.Fatal(err)
			}
			err = s.Check()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Check after %s: %v, want an error mentioning %q", c.name, err, c.want)
			}
		})
	}
}

// TestPurgeLeavesNothingOfTheStepLayout purges, a few records at a time,
// an execution whose log holds a step record no slot names and whose
// steps bucket holds a counter-only slot, and expects nothing of it left:
// no slot, no record, no input, and Check clean.
func TestPurgeLeavesNothingOfTheStepLayout(t *testing.T) {
	const id = "01960000-0000-7000-8000-000000000001"
	s := openStore(t, Options{NoSync: true}, false)
	err := s.Update(t.Context(), func(tx kernel.Tx) error {
		e := &kernel.Execution{ID: id, Tenant: "t", AgentID: "a", LastSeq: 3, Input: []byte(`{"x":1}`)}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		// An execution whose id extends this one's must survive the purge.
		if err := tx.PutExecution(&kernel.Execution{ID: id + "x", Tenant: "t", AgentID: "a", Input: []byte(`2`)}); err != nil {
			return err
		}
		for seq := uint64(1); seq <= 3; seq++ {
			typ := kernel.EvStepProposed
			if seq == 1 {
				typ = kernel.EvExecutionCreated
			}
			if err := tx.AppendEvent("t", kernel.Event{ExecutionID: id, Seq: seq, Type: typ, Payload: []byte(`{}`)}); err != nil {
				return err
			}
		}
		for _, st := range []string{"s1", "s2"} {
			seq := uint64(2)
			if st == "s2" {
				seq = 3
			}
			if err := tx.PutStep(&kernel.Step{ID: st, ExecutionID: id, Tenant: "t", Seq: seq}); err != nil {
				return err
			}
			if err := tx.PutOccurrence("t", id, st, kernel.Occurrence{Count: 1}); err != nil {
				return err
			}
		}
		return tx.PutOccurrence("t", id, "legacy\x00h\x00target", kernel.Occurrence{Count: 2})
	})
	if err != nil {
		t.Fatal(err)
	}
	// A stray record: its slot is gone.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bEvents).Put(stepLogKey("t", id, 3, "s3"),
			encodeStep(&kernel.Step{ID: "s3", ExecutionID: id, Tenant: "t", Seq: 3})); err != nil {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if i > 20 {
			t.Fatal("DeleteExecution never finished")
		}
		var done bool
		err := s.Update(t.Context(), func(tx kernel.Tx) error {
			var err error
			_, done, err = tx.DeleteExecution("t", id, 2)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		pfx := prefix("t", id)
		for _, b := range [][]byte{bEvents, bSteps} {
			if k, _ := tx.Bucket(b).Cursor().Seek(pfx); k != nil && strings.HasPrefix(string(k), string(pfx)) {
				t.Errorf("%s: %q left", b, k)
			}
		}
		if tx.Bucket(bExecutions).Get(inputKey(key("t", id))) != nil {
			t.Error("the input is left")
		}
		if tx.Bucket(bExecutions).Get(inputKey(key("t", id+"x"))) == nil {
			t.Error("the input of the neighbouring execution went too")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Errorf("Check after the purge: %v", err)
	}
}
