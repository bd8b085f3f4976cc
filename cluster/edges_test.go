package cluster_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/tunnel"
)

// edgeTunnels are the tunnel options of the edge box named name's tunnels.
func edgeTunnels(name string) tunnel.Options {
	return tunnel.Options{InboxPrefix: cluster.EdgeInboxPrefix(name), DialTimeout: eventually.Deadline}
}

// answerAs listens on nc for the tunnels to the edge box named name and
// answers each with who, until the test ends.
func answerAs(t *testing.T, nc *nats.Conn, name, who string) {
	t.Helper()
	l, err := tunnel.Listen(nc, cluster.EdgeDialSubject(name), edgeTunnels(name))
	if err != nil {
		t.Fatalf("%s listens as %s: %v", who, name, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = c.Write([]byte(who))
			})
		}
	})
}

// dialEdge dials the edge box named name through nc and returns what
// answered.
func dialEdge(t *testing.T, nc *nats.Conn, name string) (string, error) {
	t.Helper()
	c, err := tunnel.Dial(t.Context(), nc, cluster.EdgeDialSubject(name), edgeTunnels(name))
	if err != nil {
		return "", err
	}
	defer c.Close()
	who, err := io.ReadAll(c)
	return string(who), err
}

// edgesConn is a connection of n's into EdgesAccount, closed at the end of
// the test.
func edgesConn(t *testing.T, n *cluster.Node, name string) *nats.Conn {
	t.Helper()
	nc, err := n.ConnectEdges(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestAClusteredHubBindsEachEdgeBoxToTheNameItsCertificateCarries runs a
// hub of two clustered nodes, n1 taking leaf links (with a CA), and edge
// boxes linked to n1: A (certificate and name edge-a), B (certificate and
// name edge-b), and an impostor (certificate edge-b, name edge-a).
//
//   - The clustered hub takes leaf links at all (its client listener's
//     password once refused every one).
//   - The impostor's link is refused, and the hub says why; the impostor
//     says at start that its certificate names another box. A's link
//     stays up (a second link under A's server name would have cut A's).
//   - B also listens on edge-a's dial subject, which its permissions do not
//     let it receive: 20 dials to edge-a from n2, the node no edge box is
//     linked to, all reach A. A dial to edge-b reaches B.
//   - A spy on B's side of the link, subscribed to everything, sees none
//     of A's tunnels nor anything of the hub's global account (its
//     JetStream's API and a stream written meanwhile, inboxes): only its
//     own subjects.
func TestAClusteredHubBindsEachEdgeBoxToTheNameItsCertificateCarries(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	caPath := caFile(t, ca)
	leaf := loopback.FreeAddr(t)
	routes := []string{loopback.FreeAddr(t), loopback.FreeAddr(t)}
	var hubLog syncbuf.Buffer
	hubs := make([]*cluster.Node, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range hubs {
		o := cluster.Options{Name: "gh", NodeName: fmt.Sprintf("n%d", i+1), Listen: routes[i], Peers: routes, Dir: t.TempDir(), ReadyTimeout: 20 * time.Second}
		if i == 0 {
			o.LeafListen, o.LeafTLS = leaf, nodeTLS(t, ca, 10, caPath)
			o.Logger = slog.New(slog.NewTextHandler(&hubLog, nil))
		}
		wg.Go(func() { hubs[i], errs[i] = start(t, o) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	box := func(node, certName string, serial int64, log io.Writer) *cluster.Node {
		t.Helper()
		cert, key := ca.WriteEdgePair(t, serial, certName, "127.0.0.1")
		n, err := start(t, cluster.Options{NodeName: node, Domain: node, LeafRemotes: []string{"tls://" + leaf}, Dir: t.TempDir(),
			LeafTLS: cluster.TLSFiles{Cert: cert, Key: key, CA: caPath}, Logger: slog.New(slog.NewTextHandler(log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	linked := func(n *cluster.Node, want int) func() error {
		return func() error {
			if got := len(n.Status(t.Context()).Leafs); got != want {
				return fmt.Errorf("%d leaf links, want %d", got, want)
			}
			return nil
		}
	}
	a := box("edge-a", "edge-a", 11, io.Discard)
	b := box("edge-b", "edge-b", 12, io.Discard)
	eventually.Check(t, linked(hubs[0], 2))

	var impostorLog syncbuf.Buffer
	impostor := box("edge-a", "edge-b", 13, &impostorLog)
	eventually.True(t, "the hub refuses the impostor's link", func() bool {
		return strings.Contains(hubLog.String(), "refused a leaf link: the edge box goes by another name than its certificate's")
	})
	if !strings.Contains(impostorLog.String(), "leaf certificate names another edge box") {
		t.Errorf("the impostor did not say its certificate names another box; its log:\n%s", impostorLog.String())
	}
	for _, check := range []func() error{linked(a, 1), linked(b, 1), linked(hubs[0], 2), linked(impostor, 0)} {
		if err := check(); err != nil {
			t.Error(err)
		}
	}

	answerAs(t, edgesConn(t, a, "a"), "edge-a", "A")
	bConn := edgesConn(t, b, "b")
	answerAs(t, bConn, "edge-b", "B")
	answerAs(t, bConn, "edge-a", "B")
	answerAs(t, edgesConn(t, impostor, "impostor"), "edge-a", "impostor")

	spy, err := bConn.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	// The last message the spy waits for, on B's own subjects, which B
	// asks for.
	last := cluster.EdgeInboxPrefix("edge-b") + ".last"
	if _, err := bConn.SubscribeSync(last); err != nil {
		t.Fatal(err)
	}
	// Once a message B sends reaches n2, the hub has what B asked of it
	// before: its interest, had it been let through.
	ready, err := edgesConn(t, hubs[1], "ready").SubscribeSync(cluster.EdgeInboxPrefix("edge-b") + ".ready")
	if err != nil {
		t.Fatal(err)
	}
	eventually.Check(t, func() error {
		if err := bConn.Publish(cluster.EdgeInboxPrefix("edge-b")+".ready", nil); err != nil {
			return err
		}
		_, err := ready.NextMsg(50 * time.Millisecond)
		return err
	})

	dialer := edgesConn(t, hubs[1], "dialer")
	for i := range 20 {
		who, err := dialEdge(t, dialer, "edge-a")
		if err != nil || who != "A" {
			t.Fatalf("dial %d to edge-a: %q, %v; want A", i+1, who, err)
		}
	}
	if who, err := dialEdge(t, dialer, "edge-b"); err != nil || who != "B" {
		t.Fatalf("dial to edge-b: %q, %v; want B", who, err)
	}

	// The hub's own traffic meanwhile: a stream written through its
	// JetStream, and a request and its answer on inboxes.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if _, err := hubs[0].JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: "HUB", Subjects: []string{"hub.journal"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := hubs[1].JetStream().Publish(ctx, "hub.journal", fmt.Appendf(nil, "group %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	echo, err := hubs[0].Conn().Subscribe("hub.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Unsubscribe()
	if _, err := hubs[0].Conn().Request("hub.echo", []byte("hi"), eventually.Deadline); err != nil {
		t.Fatal(err)
	}
	// The last message, after all of the above: the spy has whatever
	// reached it by the time this does.
	if err := dialer.Publish(last, nil); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := spy.NextMsg(eventually.Deadline)
		if err != nil {
			t.Fatalf("the spy never got %s: %v", last, err)
		}
		if !strings.HasPrefix(m.Subject, "gatehouse.edge.edge-b.") {
			t.Errorf("B's side of the link saw %q", m.Subject)
		}
		if m.Subject == last {
			break
		}
	}
}

// TestCertEdgeNameIsTheSubjectsOneCommonName: a leaf certificate names the
// edge box of its subject's common name, which must be one node name.
func TestCertEdgeNameIsTheSubjectsOneCommonName(t *testing.T) {
	cn := asn1.ObjectIdentifier{2, 5, 4, 3}
	for _, tc := range []struct {
		name    string
		subject pkix.Name
		dns     []string
		want    string
	}{
		{"a common name", pkix.Name{CommonName: "edge-7", Organization: []string{"example"}}, []string{"edge-8.example.com"}, "edge-7"},
		{"no common name, a DNS name", pkix.Name{Organization: []string{"example"}}, []string{"edge-7"}, ""},
		{"a host name", pkix.Name{CommonName: "edge-7.example.com"}, nil, ""},
		{"a wildcard", pkix.Name{CommonName: "*"}, nil, ""},
		{"a space", pkix.Name{CommonName: "edge 7"}, nil, ""},
		{"two common names", pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: cn, Value: "edge-7"}, {Type: cn, Value: "edge-8"}}}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Subject.Names is what parsing a certificate fills.
			var rdns pkix.RDNSequence
			if _, err := asn1.Unmarshal(mustMarshal(t, tc.subject.ToRDNSequence()), &rdns); err != nil {
				t.Fatal(err)
			}
			var subject pkix.Name
			subject.FillFromRDNSequence(&rdns)
			got, err := cluster.CertEdgeName(&x509.Certificate{Subject: subject, DNSNames: tc.dns})
			switch {
			case tc.want == "" && !errors.Is(err, cluster.ErrEdgeCert):
				t.Fatalf("%q, %v; want ErrEdgeCert", got, err)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Fatalf("%q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := asn1.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
