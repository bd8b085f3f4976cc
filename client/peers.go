package client

import (
	"context"
	"net/url"
	"time"
)

// Peer is one consumer the gateway remembers: an agent, runner or channel
// connection, identified by role, id and consumer id.
type Peer struct {
	Role       string `json:"role"`
	ID         string `json:"id"`
	ConsumerID string `json:"consumer_id"`
	// State is online, offline or lost (the gateway gave up on it after
	// its grace period and handed its work to others).
	State    string    `json:"state"`
	LastSeen time.Time `json:"last_seen"`
	// AckedSequence and LatestSequence bound the consumer's outbox;
	// Pending deliveries are not acknowledged yet.
	AckedSequence  uint64 `json:"acked_sequence"`
	LatestSequence uint64 `json:"latest_sequence"`
	Pending        uint64 `json:"pending"`
}

// PeerListOptions filter and page ListPeers. Zero fields do not filter.
type PeerListOptions struct {
	// Role keeps agent, runner or channel consumers only.
	Role string
	// Cursor continues after the previous page (its NextCursor).
	Cursor string
	// Limit is the page size; zero means the server's 100, at most 1000.
	Limit int
}

// PeerPage is one page of consumers, in key order (role/id/consumer id).
type PeerPage struct {
	Epoch string `json:"epoch"`
	Peers []Peer `json:"peers"`
	// NextCursor continues with the next page; empty on the last one.
	NextCursor string `json:"next_cursor"`
}

// ListPeers returns one page of the consumers the caller may see: an
// admin sees all, an agent or runner the consumers of its own ids.
func (c *Client) ListPeers(ctx context.Context, o PeerListOptions) (*PeerPage, error) {
	q := url.Values{}
	if o.Role != "" {
		q.Set("role", o.Role)
	}
	var page PeerPage
	if err := c.list(ctx, "/v0/peers", q, o.Cursor, o.Limit, &page); err != nil {
		return nil, err
	}
	return &page, nil
}
