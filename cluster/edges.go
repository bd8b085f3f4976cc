package cluster

import (
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/nats-io/nats-server/v2/server"
)

// EdgesAccount is the NATS account of edge boxes' tunnels on every embedded
// server: a hub binds each edge box's leaf link to it, an edge box binds
// its side of the link to it, and a node's tunnel connection
// (ConnectEdges) joins it. Nothing else runs there: the node's journal,
// lease, positions and JetStream are in the global account, which no leaf
// link reaches. Every node of a cluster configures it, so its interest
// crosses the routes and any node reaches an edge box linked to another.
const EdgesAccount = "EDGES"

// edgeSubjectRoot is the root of every subject of an edge box's tunnels.
const edgeSubjectRoot = "gatehouse.edge."

// EdgeDialSubject is the subject on which the edge box named name takes
// the connections its hubs pass on (a tunnel's dial requests).
func EdgeDialSubject(name string) string { return edgeSubjectRoot + name + ".dial" }

// EdgeInboxPrefix is the prefix of the inboxes of the edge box named
// name's tunnels (tunnel.Options.InboxPrefix), on both ends: a hub's dial
// replies and frame inboxes as well as the box's, so that the box's
// permissions can name them all.
func EdgeInboxPrefix(name string) string { return edgeSubjectRoot + name + ".conn" }

// edgeSubjects are all the subjects of the edge box named name, which
// may be "*" for any box.
func edgeSubjects(name string) string { return edgeSubjectRoot + name + ".>" }

// ErrEdgeCert is wrapped by CertEdgeName's refusals: the certificate names
// no edge box.
var ErrEdgeCert = errors.New("cluster: the leaf certificate names no edge box")

// oidCommonName is the X.509 attribute type of a subject's common name.
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// CertEdgeName is the name of the edge box a leaf certificate is for: its
// subject's common name, which must be one node name (no spaces, '.', '*'
// or '>'). The common name, not a DNS name among the subject alternative
// names: a certificate has one subject but may carry several SANs, which
// are for the hosts a server certificate is valid for, and a box's name is
// not a host name (it names a NATS subject token, with no dots).
func CertEdgeName(cert *x509.Certificate) (string, error) {
	cns := 0
	for _, a := range cert.Subject.Names {
		if a.Type.Equal(oidCommonName) {
			cns++
		}
	}
	switch name := cert.Subject.CommonName; {
	case cns > 1:
		return "", fmt.Errorf("%w: its subject has %d common names, want one", ErrEdgeCert, cns)
	case name == "":
		return "", fmt.Errorf("%w: its subject has no common name", ErrEdgeCert)
	case !validName(name):
		return "", fmt.Errorf("%w: its subject's common name %q is not a node name (no spaces, '.', '*' or '>')", ErrEdgeCert, name)
	default:
		return name, nil
	}
}

// edgePermissions are what the edge box named name may do on its hub:
// its own subjects both ways, its dial subject and its tunnels' inboxes
// (under the prefix its hubs dial it with), nothing else.
//
// The rule, in nats-server v2.15.2: a hub's leaf user's permissions are
// read from the leaf's side of the link. Publish is what the box may send
// into the hub, Subscribe what it may receive from it. The hub keeps them
// as the link's Export and Import (client.go:1234) and hands them to the
// box, which applies Export as its publish and Import as its subscribe
// permissions (leafnode.go:1804) and so sends the hub no interest in
// another subject (sendLeafNodeSubUpdate, leafnode.go:2903). On the hub,
// processLeafNodeConnect swaps the link's live permissions, data flowing
// the other way there (leafnode.go:2410): the box's interest must pass
// the swapped publish side, which is Subscribe (processLeafSub,
// leafnode.go:3094), and what the box sends must pass Export, which is
// Publish (leafMsgAllowed, leafnode.go:3412); a breach closes the link.
func edgePermissions(name string) *server.Permissions {
	own := []string{edgeSubjects(name)}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: own},
		Subscribe: &server.SubjectPermission{Allow: own},
	}
}

// accounts are the embedded server's accounts: the global one, with
// JetStream, and EdgesAccount, without. nats-server enables JetStream on
// the global account by itself only when no other account is configured
// (jetstream.go enableJetStreamAccounts, globalAccountOnly); otherwise only
// on an account whose configuration enables it, and the configuration
// parser refuses to configure the global account by name ("$G" is
// reserved). So the global account's entry is parsed under another name
// and renamed: server.configureAccounts then copies its JetStream limits
// onto the global account (Account.shallowCopy), as it copies the global
// mappings of a configuration file. JetStream keeps the global account's
// files where they were.
func accounts() ([]*server.Account, error) {
	const global = "GATEHOUSE_GLOBAL"
	var o server.Options
	if err := o.ProcessConfigString("accounts: { " + global + ": { jetstream: enabled }, " + EdgesAccount + ": {} }"); err != nil {
		return nil, fmt.Errorf("cluster: NATS accounts: %w", err)
	}
	for _, a := range o.Accounts {
		if a.Name == global {
			a.Name = server.DEFAULT_GLOBAL_ACCOUNT
		}
	}
	return o.Accounts, nil
}

// authenticator decides who may connect to the embedded server, and into
// which account (server.Options.CustomClientAuthentication):
//   - the node's own in-process connections, with a password only this
//     process knows: into the global account, or, for tunnels, into
//     EdgesAccount;
//   - clients of Options.ClientListen (the operator's loopback listener)
//     without credentials: into the global account, as before there was
//     an authenticator;
//   - leaf links: into EdgesAccount, each allowed only its own edge box's
//     subjects when the hub verifies certificates (LeafTLS.CA), named by
//     CertEdgeName, which must also be the box's node name; any edge
//     box's otherwise.
//
// It is nats-server's own TLS map (verify_and_map) in spirit, which maps a
// certificate to a user only from a list configured in advance: here the
// certificate's name is the edge box's name, with no list to keep.
type authenticator struct {
	global, tunnels credential
	// openClients lets clients without credentials into the global
	// account: Options.ClientListen is set.
	openClients bool
	// verifiedLeafs: leaf links present a certificate the CA verified,
	// which names their edge box.
	verifiedLeafs bool
	log           *slog.Logger
	// globalAcc and edgesAcc are the server's accounts, set by bind
	// before the server starts.
	globalAcc, edgesAcc *server.Account
}

// credential is a user and password of an in-process connection.
type credential struct{ user, password string }

// inProcess users: the node's own connections, and its tunnels'.
const (
	inProcessUser = "gatehouse"
	tunnelUser    = "gatehouse-tunnels"
)

func newCredential(user string) (credential, error) {
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return credential{}, fmt.Errorf("cluster: client password: %w", err)
	}
	return credential{user: user, password: hex.EncodeToString(secret[:])}, nil
}

func newAuthenticator(o *Options) (*authenticator, error) {
	a := &authenticator{openClients: o.ClientListen != "", verifiedLeafs: o.LeafTLS.CA != "" && o.LeafListen != "", log: o.Logger}
	var err error
	if a.global, err = newCredential(inProcessUser); err != nil {
		return nil, err
	}
	if a.tunnels, err = newCredential(tunnelUser); err != nil {
		return nil, err
	}
	return a, nil
}

// bind finds the accounts the authenticator admits clients to on srv,
// which has not started yet.
func (a *authenticator) bind(srv *server.Server) error {
	a.globalAcc = srv.GlobalAccount()
	edges, err := srv.LookupAccount(EdgesAccount)
	if err != nil {
		return fmt.Errorf("cluster: NATS account %s: %w", EdgesAccount, err)
	}
	a.edgesAcc = edges
	return nil
}

// Check admits c, or refuses it (the server then closes it with an
// authorization error).
func (a *authenticator) Check(c server.ClientAuthentication) bool {
	switch c.Kind() {
	case server.CLIENT:
		return a.checkClient(c)
	case server.LEAF:
		return a.checkLeaf(c)
	}
	return false
}

func (a *authenticator) checkClient(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	switch {
	case o.Username == a.global.user && a.global.matches(o.Password):
		c.RegisterUser(&server.User{Username: o.Username, Account: a.globalAcc})
	case o.Username == a.tunnels.user && a.tunnels.matches(o.Password):
		c.RegisterUser(&server.User{Username: o.Username, Account: a.edgesAcc})
	case a.openClients && o.Username == "" && o.Password == "" && o.Token == "" && o.Nkey == "" && o.JWT == "":
		c.RegisterUser(&server.User{Account: a.globalAcc})
	default:
		return false
	}
	return true
}

func (a *authenticator) checkLeaf(c server.ClientAuthentication) bool {
	if !a.verifiedLeafs {
		c.RegisterUser(&server.User{Account: a.edgesAcc, Permissions: edgePermissions("*")})
		return true
	}
	st := c.GetTLSConnectionState()
	if st == nil || len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		a.log.Warn("refused a leaf link without a verified certificate", "addr", c.RemoteAddress())
		return false
	}
	name, err := CertEdgeName(st.PeerCertificates[0])
	if err != nil {
		a.log.Warn("refused a leaf link", "addr", c.RemoteAddress(), "err", err)
		return false
	}
	// The box's server name (its --node-name, in the link's CONNECT) must
	// be its certificate's name too: the hub keeps one link per server
	// name and account, and closes the older when another comes
	// (leafnode.go addLeafNodeConnection), so a box that went by another
	// box's name would cut that box's link each time it linked.
	if server := c.GetOpts().Name; server != name {
		a.log.Warn("refused a leaf link: the edge box goes by another name than its certificate's", "addr", c.RemoteAddress(), "node", server, "certificate", name)
		return false
	}
	c.RegisterUser(&server.User{Username: name, Account: a.edgesAcc, Permissions: edgePermissions(name)})
	return true
}

func (cr credential) matches(password string) bool {
	return subtle.ConstantTimeCompare([]byte(cr.password), []byte(password)) == 1
}

// warnCertName logs, on an edge box, a leaf certificate that names another
// box than this one (or none): a hub that verifies certificates passes it
// only the connections of the name its certificate carries.
func warnCertName(o *Options) {
	if len(o.LeafRemotes) == 0 || o.LeafTLS.Cert == "" {
		return
	}
	data, err := os.ReadFile(o.LeafTLS.Cert)
	if err != nil {
		return // the TLS configuration names the file's error
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return
	}
	switch name, err := CertEdgeName(cert); {
	case err != nil:
		o.Logger.Warn("this edge box's leaf certificate names no edge box: a hub that checks certificates (--leaf-tls-ca) refuses its link; give it a certificate whose subject's common name is its --node-name",
			"node", o.NodeName, "err", err)
	case name != o.NodeName:
		o.Logger.Warn("this edge box's leaf certificate names another edge box: a hub that checks certificates (--leaf-tls-ca) refuses its link; give it a certificate whose subject's common name is its --node-name",
			"node", o.NodeName, "certificate", name)
	}
}
