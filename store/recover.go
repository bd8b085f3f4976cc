package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/table"
	"google.golang.org/protobuf/proto"
)

// Badger v4 leaves two states behind a power cut that it then refuses to
// open, although neither holds anything the store relies on. The store
// clears them before it opens Badger (recoverBadger); the power-cut tests
// (TestPowerCutFS...) reproduce both.
//
//   - An empty memory-table or value log: Badger creates a log, sizes it
//     and maps it, and syncs only its bytes, later; once something else
//     syncs the folder, a cut leaves the name with no bytes at all, which
//     Badger takes for a new log it failed to create ("Create a new
//     file"). Such a log holds no write.
//   - A table named in the MANIFEST whose file is gone: Badger writes a
//     memory table out as a table and adds it to the MANIFEST, which it
//     syncs, without syncing the folder that names the table ("file does
//     not exist for table N"). The store lets the journal go only once it
//     has synced the folder (see checkpoint), so the journal still holds
//     every write of such a table: its entry is deleted from the MANIFEST
//     and the journal's replay writes them again.

// recoverBadger clears, in Badger's folder, what a power cut leaves that
// Badger would refuse to open (see above).
func recoverBadger(bo badger.Options, log *slog.Logger) error {
	dropped, err := dropEmptyLogs(bo.Dir)
	if err != nil {
		return err
	}
	missing, err := dropMissingTables(bo)
	if err != nil {
		return err
	}
	if dropped == 0 && len(missing) == 0 {
		return nil
	}
	log.Warn("store: cleared what a power cut left of Badger's files; the journal replays their writes",
		"empty_logs", dropped, "tables_never_synced", missing)
	return syncDir(bo.Dir)
}

// dropEmptyLogs removes the memory-table and value logs in dir that hold
// nothing at all, not even their header, and returns how many.
func dropEmptyLogs(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("store: open %q: %w", dir, err)
	}
	dropped := 0
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); ext != ".mem" && ext != ".vlog" {
			continue
		}
		fi, err := e.Info()
		if err != nil || fi.Size() != 0 || !fi.Mode().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return dropped, fmt.Errorf("store: open %q: remove an empty log: %w", dir, err)
		}
		dropped++
	}
	return dropped, nil
}

// dropMissingTables deletes from Badger's MANIFEST the tables whose files
// are gone, appending one change set as Badger itself does, and returns
// their ids.
func dropMissingTables(bo badger.Options) ([]uint64, error) {
	path := filepath.Join(bo.Dir, badger.ManifestFilename)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: open the MANIFEST: %w", err)
	}
	defer f.Close()
	m, end, err := badger.ReplayManifestFile(f, bo.ExternalMagicVersion, bo)
	if err != nil {
		return nil, nil // Badger says what is wrong with it
	}
	var missing []uint64
	changes := &pb.ManifestChangeSet{}
	for id := range m.Tables {
		if _, err := os.Stat(table.NewFilename(id, bo.Dir)); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, id)
			changes.Changes = append(changes.Changes, &pb.ManifestChange{Id: id, Op: pb.ManifestChange_DELETE})
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	rec, err := proto.Marshal(changes)
	if err != nil {
		return nil, fmt.Errorf("store: MANIFEST: %w", err)
	}
	// The record's length and its CRC-32C, big-endian, then the record;
	// written where the last whole record ends, over a torn one.
	buf := make([]byte, 8, 8+len(rec))
	binary.BigEndian.PutUint32(buf[0:4], uint32(len(rec)))
	binary.BigEndian.PutUint32(buf[4:8], crc32.Checksum(rec, castagnoli))
	buf = append(buf, rec...)
	if _, err := f.WriteAt(buf, end); err != nil {
		return nil, fmt.Errorf("store: MANIFEST: %w", err)
	}
	if err := f.Truncate(end + int64(len(buf))); err != nil {
		return nil, fmt.Errorf("store: MANIFEST: %w", err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("store: MANIFEST: %w", err)
	}
	return missing, nil
}
