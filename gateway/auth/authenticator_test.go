package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	testIssuer   = "https://issuer.test"
	testAudience = "gatehouse"
	testStatic   = "s3cret-static-token"
)

var testNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func secret(b byte) []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = b
	}
	return s
}

func header(token string) []byte { return []byte("Bearer " + token) }

// baseClaims is a valid admin token body for the test issuer and audience.
func baseClaims() Claims {
	return Claims{Subject: "alice", Role: RoleAdmin, TTL: time.Hour, Issuer: testIssuer, Audience: testAudience}
}

func mintHS(t testing.TB, key []byte, c Claims, now time.Time) string {
	t.Helper()
	s, err := MintHS256(key, c, now)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signRaw signs arbitrary claims, for tokens Mint deliberately refuses to
// produce.
// A kid argument, even "", is put in the header.
func signRaw(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims, kid ...string) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if len(kid) > 0 {
		tok.Header["kid"] = kid[0]
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validMap() jwt.MapClaims {
	return jwt.MapClaims{
		"sub":  "alice",
		"role": "admin",
		"iss":  testIssuer,
		"aud":  testAudience,
		"exp":  testNow.Add(time.Hour).Unix(),
	}
}

func without(m jwt.MapClaims, key string) jwt.MapClaims {
	delete(m, key)
	return m
}

func with(m jwt.MapClaims, key string, v any) jwt.MapClaims {
	m[key] = v
	return m
}

// newEdKeys generates an Ed25519 key pair.
func newEdKeys(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// newRSAKey generates an RSA key with a modulus of bits.
func newRSAKey(t testing.TB, bits int) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func writePublicKey(t testing.TB, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, "PUBLIC KEY", der)
}

func newAuth(t testing.TB, o Options) *Authenticator {
	t.Helper()
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type authCase struct {
	name    string
	header  []byte
	now     time.Time
	wantErr error
	wantSub string
}

func runAuthCases(t *testing.T, a *Authenticator, cases []authCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = testNow
			}
			p, err := a.Authenticate(tt.header, now)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("want %v, got principal %+v, err %v", tt.wantErr, p, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if p.Subject != tt.wantSub {
				t.Fatalf("subject = %q, want %q", p.Subject, tt.wantSub)
			}
		})
	}
}

func TestOpenMode(t *testing.T) {
	a := newAuth(t, Options{})
	if !a.Open() {
		t.Fatal("empty options should be open")
	}
	for _, h := range [][]byte{nil, []byte("garbage"), header("anything")} {
		p, err := a.Authenticate(h, testNow)
		if err != nil {
			t.Fatalf("%q: %v", h, err)
		}
		if p.Subject != "local" || p.Role != RoleAdmin || !p.ExpiresAt.IsZero() {
			t.Fatalf("%q: got %+v", h, p)
		}
	}
}

// TestSoleSubject: the subject every caller has when the credentials
// make one principal, and none when JWTs may name several.
func TestSoleSubject(t *testing.T) {
	jwt := map[string][]byte{"": secret('k')}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "local"},
		{Options{StaticToken: testStatic}, "static"},
		{Options{HMACSecrets: jwt, Issuer: "i", Audience: "a"}, ""},
		{Options{StaticToken: testStatic, HMACSecrets: jwt, Issuer: "i", Audience: "a"}, ""},
	} {
		if got := newAuth(t, c.o).SoleSubject(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.o, got, c.want)
		}
	}
}

func TestStaticToken(t *testing.T) {
	a := newAuth(t, Options{StaticToken: testStatic})
	if a.Open() {
		t.Fatal("static token configured but Open() is true")
	}
	runAuthCases(t, a, []authCase{
		{name: "ok", header: header(testStatic), wantSub: "static"},
		{name: "wrong token", header: header("nope"), wantErr: ErrInvalidToken},
		{name: "prefix of token", header: header(testStatic[:5]), wantErr: ErrInvalidToken},
		{name: "lowercase scheme", header: []byte("bearer " + testStatic), wantErr: ErrMalformed},
		{name: "double space", header: []byte("Bearer  " + testStatic), wantErr: ErrMalformed},
		{name: "trailing space", header: []byte("Bearer " + testStatic + " "), wantErr: ErrMalformed},
		{name: "empty token", header: []byte("Bearer "), wantErr: ErrMalformed},
		{name: "scheme only", header: []byte("Bearer"), wantErr: ErrMalformed},
		{name: "basic scheme", header: []byte("Basic " + testStatic), wantErr: ErrMalformed},
		{name: "missing header", header: nil, wantErr: ErrMissingToken},
		{name: "empty header", header: []byte{}, wantErr: ErrMissingToken},
	})
	p, err := a.Authenticate(header(testStatic), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if p.Role != RoleAdmin || !p.ExpiresAt.IsZero() {
		t.Fatalf("static principal = %+v", p)
	}
}

func TestHS256(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{
		StaticToken: testStatic,
		HMACSecrets: map[string][]byte{"": key},
		Issuer:      testIssuer,
		Audience:    testAudience,
	})
	ok := mintHS(t, key, baseClaims(), testNow)
	runAuthCases(t, a, []authCase{
		{name: "ok", header: header(ok), wantSub: "alice"},
		{name: "static still accepted", header: header(testStatic), wantSub: "static"},
		{name: "expired beyond leeway", header: header(ok), now: testNow.Add(time.Hour + 31*time.Second), wantErr: ErrExpiredToken},
		{name: "expired within leeway", header: header(ok), now: testNow.Add(time.Hour + 29*time.Second), wantSub: "alice"},
		{name: "wrong secret", header: header(mintHS(t, secret('x'), baseClaims(), testNow)), wantErr: ErrInvalidToken},
		{name: "missing exp", header: header(signRaw(t, jwt.SigningMethodHS256, key, without(validMap(), "exp"))), wantErr: ErrInvalidToken},
		{name: "wrong audience", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "aud", "other"))), wantErr: ErrInvalidToken},
		{name: "missing audience", header: header(signRaw(t, jwt.SigningMethodHS256, key, without(validMap(), "aud"))), wantErr: ErrInvalidToken},
		{name: "wrong issuer", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "iss", "evil"))), wantErr: ErrInvalidToken},
		{name: "missing issuer", header: header(signRaw(t, jwt.SigningMethodHS256, key, without(validMap(), "iss"))), wantErr: ErrInvalidToken},
		{name: "unknown role", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "role", "root"))), wantErr: ErrInvalidToken},
		{name: "missing role", header: header(signRaw(t, jwt.SigningMethodHS256, key, without(validMap(), "role"))), wantErr: ErrInvalidToken},
		{name: "missing sub", header: header(signRaw(t, jwt.SigningMethodHS256, key, without(validMap(), "sub"))), wantErr: ErrInvalidToken},
		{name: "empty sub", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "sub", ""))), wantErr: ErrInvalidToken},
		{name: "not yet valid", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "nbf", testNow.Add(time.Minute).Unix()))), wantErr: ErrInvalidToken},
		{name: "not yet valid within leeway (clock skew)", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "nbf", testNow.Add(20*time.Second).Unix()))), wantSub: "alice"},
		{name: "exp as a string", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "exp", "9999999999"))), wantErr: ErrInvalidToken},
		{name: "nbf as a string", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "nbf", "0"))), wantErr: ErrInvalidToken},
		{name: "exp as a fraction", header: header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "exp", float64(testNow.Add(time.Hour).Unix())+0.5))), wantSub: "alice"},
		{name: "alg none", header: header(signRaw(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, validMap())), wantErr: ErrInvalidToken},
		{name: "HS512 not pinned", header: header(signRaw(t, jwt.SigningMethodHS512, key, validMap())), wantErr: ErrInvalidToken},
		{name: "garbage", header: header("a.b.c"), wantErr: ErrInvalidToken},
		{name: "tampered payload", header: header(ok[:len(ok)-2] + "AA"), wantErr: ErrInvalidToken},
	})
}

func TestClaimsBecomePrincipal(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	c := baseClaims()
	c.Role = RoleAgent
	c.Agents = []string{"a1", "a2"}
	c.Runners = []string{"r1"}
	c.Sessions = []string{"s1"}
	c.Tenant = "acme"
	p, err := a.Authenticate(header(mintHS(t, key, c, testNow)), testNow)
	if err != nil {
		t.Fatal(err)
	}
	want := Principal{
		Subject: "alice", Role: RoleAgent, Agents: []string{"a1", "a2"}, Runners: []string{"r1"},
		Sessions: []string{"s1"}, Tenant: "acme", ExpiresAt: testNow.Add(time.Hour),
	}
	if p.Subject != want.Subject || p.Role != want.Role || p.Tenant != want.Tenant ||
		!slices.Equal(p.Agents, want.Agents) || !slices.Equal(p.Runners, want.Runners) ||
		!slices.Equal(p.Sessions, want.Sessions) || !p.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("principal = %+v, want %+v", p, want)
	}
}

func TestPublicKeys(t *testing.T) {
	edPub, edPriv := newEdKeys(t)
	rsaKey := newRSAKey(t, 2048)
	edPath := writePublicKey(t, edPub)
	rsaPath := writePEM(t, "RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rsaKey.PublicKey))
	edPEM, err := os.ReadFile(edPath)
	if err != nil {
		t.Fatal(err)
	}
	rsaPKIX, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, Options{
		PublicKeyFiles: map[string]string{"ed": edPath, "rsa": rsaPath},
		Issuer:         testIssuer,
		Audience:       testAudience,
	})

	edTok, err := MintEdDSA(edPriv, baseClaims(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	runAuthCases(t, a, []authCase{
		{name: "EdDSA ok", header: header(edTok), wantSub: "alice"},
		{name: "EdDSA with kid", header: header(signRaw(t, jwt.SigningMethodEdDSA, edPriv, validMap(), "ed")), wantSub: "alice"},
		{name: "RS256 ok", header: header(signRaw(t, jwt.SigningMethodRS256, rsaKey, validMap())), wantSub: "alice"},
		{name: "RS256 with kid", header: header(signRaw(t, jwt.SigningMethodRS256, rsaKey, validMap(), "rsa")), wantSub: "alice"},
		{name: "RS256 token naming the Ed25519 kid", header: header(signRaw(t, jwt.SigningMethodRS256, rsaKey, validMap(), "ed")), wantErr: ErrInvalidToken},
		{name: "HS256 keyed with Ed25519 PEM", header: header(signRaw(t, jwt.SigningMethodHS256, edPEM, validMap())), wantErr: ErrInvalidToken},
		{name: "HS256 keyed with raw Ed25519 key", header: header(signRaw(t, jwt.SigningMethodHS256, []byte(edPub), validMap(), "ed")), wantErr: ErrInvalidToken},
		{name: "HS256 keyed with RSA DER", header: header(signRaw(t, jwt.SigningMethodHS256, rsaPKIX, validMap(), "rsa")), wantErr: ErrInvalidToken},
		{name: "PS256 not pinned", header: header(signRaw(t, jwt.SigningMethodPS256, rsaKey, validMap())), wantErr: ErrInvalidToken},
		{name: "expired EdDSA", header: header(edTok), now: testNow.Add(2 * time.Hour), wantErr: ErrExpiredToken},
	})
}

func TestKeySelection(t *testing.T) {
	k1, k2, anon := secret('1'), secret('2'), secret('0')
	edPub, edPriv := newEdKeys(t)
	a := newAuth(t, Options{
		HMACSecrets:    map[string][]byte{"k1": k1, "k2": k2, "": anon},
		PublicKeyFiles: map[string]string{"ed": writePublicKey(t, edPub)},
		Issuer:         testIssuer,
		Audience:       testAudience,
	})
	withKid := func(kid string) Claims {
		c := baseClaims()
		c.KeyID = kid
		return c
	}
	runAuthCases(t, a, []authCase{
		{name: "kid k1", header: header(mintHS(t, k1, withKid("k1"), testNow)), wantSub: "alice"},
		{name: "kid k2", header: header(mintHS(t, k2, withKid("k2"), testNow)), wantSub: "alice"},
		{name: "kid names another key", header: header(mintHS(t, k2, withKid("k1"), testNow)), wantErr: ErrInvalidToken},
		{name: "unknown kid", header: header(mintHS(t, k1, withKid("k9"), testNow)), wantErr: ErrInvalidToken},
		{name: "HS256 naming the EdDSA kid", header: header(mintHS(t, k1, withKid("ed"), testNow)), wantErr: ErrInvalidToken},
		{name: "no kid tries each HS256 key", header: header(mintHS(t, k2, baseClaims(), testNow)), wantSub: "alice"},
		{name: "no kid with anonymous key", header: header(mintHS(t, anon, baseClaims(), testNow)), wantSub: "alice"},
		{name: "empty kid header is no kid", header: header(signRaw(t, jwt.SigningMethodHS256, anon, with(validMap(), "sub", "bob"), "")), wantSub: "bob"},
		{name: "no kid EdDSA", header: header(signRaw(t, jwt.SigningMethodEdDSA, edPriv, validMap())), wantSub: "alice"},
		{name: "no kid unknown secret", header: header(mintHS(t, secret('9'), baseClaims(), testNow)), wantErr: ErrInvalidToken},
	})
}

// TestConcurrentClocks checks that pooled parsers never see another
// request's time: half the goroutines authenticate before exp, half after.
func TestConcurrentClocks(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	h := header(mintHS(t, key, baseClaims(), testNow))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Go(func() {
			expired := i%2 == 1
			now := testNow
			if expired {
				now = testNow.Add(2 * time.Hour)
			}
			for range 200 {
				_, err := a.Authenticate(h, now)
				if expired != errors.Is(err, ErrExpiredToken) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("clock leaked between requests: %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	edPub, edPriv := newEdKeys(t)
	privDER, err := x509.MarshalPKCS8PrivateKey(edPriv)
	if err != nil {
		t.Fatal(err)
	}
	smallRSA := newRSAKey(t, 1024)
	edPath := writePublicKey(t, edPub)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a pem file"), 0o600); err != nil {
		t.Fatal(err)
	}
	twoBlocks := filepath.Join(t.TempDir(), "two.pem")
	edBytes, err := os.ReadFile(edPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(twoBlocks, append(edBytes, edBytes...), 0o600); err != nil {
		t.Fatal(err)
	}
	hmac := map[string][]byte{"": secret('k')}

	tests := []struct {
		name string
		o    Options
	}{
		{"missing PEM file", Options{PublicKeyFiles: map[string]string{"a": filepath.Join(t.TempDir(), "absent.pem")}, Issuer: testIssuer, Audience: testAudience}},
		{"not PEM", Options{PublicKeyFiles: map[string]string{"a": garbage}, Issuer: testIssuer, Audience: testAudience}},
		{"two PEM blocks", Options{PublicKeyFiles: map[string]string{"a": twoBlocks}, Issuer: testIssuer, Audience: testAudience}},
		{"private key PEM", Options{PublicKeyFiles: map[string]string{"a": writePEM(t, "PRIVATE KEY", privDER)}, Issuer: testIssuer, Audience: testAudience}},
		{"corrupt public key", Options{PublicKeyFiles: map[string]string{"a": writePEM(t, "PUBLIC KEY", []byte("junk"))}, Issuer: testIssuer, Audience: testAudience}},
		{"RSA key too small", Options{PublicKeyFiles: map[string]string{"a": writePublicKey(t, &smallRSA.PublicKey)}, Issuer: testIssuer, Audience: testAudience}},
		{"JWT without issuer", Options{HMACSecrets: hmac, Audience: testAudience}},
		{"JWT without audience", Options{HMACSecrets: hmac, Issuer: testIssuer}},
		{"issuer without keys", Options{StaticToken: testStatic, Issuer: testIssuer}},
		{"audience without keys", Options{Audience: testAudience}},
		{"short HMAC secret", Options{HMACSecrets: map[string][]byte{"": []byte("short")}, Issuer: testIssuer, Audience: testAudience}},
		{"kid used twice", Options{HMACSecrets: map[string][]byte{"x": secret('k')}, PublicKeyFiles: map[string]string{"x": edPath}, Issuer: testIssuer, Audience: testAudience}},
		{"negative leeway", Options{HMACSecrets: hmac, Issuer: testIssuer, Audience: testAudience, Leeway: -time.Second}},
		{"static token with space", Options{StaticToken: "two words"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if a, err := New(tt.o); err == nil {
				t.Fatalf("New succeeded: %+v", a)
			}
		})
	}
}

func TestLeewayOption(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience, Leeway: 5 * time.Minute})
	tok := header(mintHS(t, key, baseClaims(), testNow))
	runAuthCases(t, a, []authCase{
		{name: "within custom leeway", header: tok, now: testNow.Add(time.Hour + 4*time.Minute), wantSub: "alice"},
		{name: "beyond custom leeway", header: tok, now: testNow.Add(time.Hour + 6*time.Minute), wantErr: ErrExpiredToken},
	})
}

func TestMintRefusesBadClaims(t *testing.T) {
	_, edPriv := newEdKeys(t)
	modify := func(f func(*Claims)) Claims {
		c := baseClaims()
		f(&c)
		return c
	}
	tests := []struct {
		name   string
		secret []byte
		c      Claims
	}{
		{"short secret", []byte("short"), baseClaims()},
		{"no subject", secret('k'), modify(func(c *Claims) { c.Subject = "" })},
		{"unknown role", secret('k'), modify(func(c *Claims) { c.Role = "root" })},
		{"no TTL", secret('k'), modify(func(c *Claims) { c.TTL = 0 })},
		{"no issuer", secret('k'), modify(func(c *Claims) { c.Issuer = "" })},
		{"no audience", secret('k'), modify(func(c *Claims) { c.Audience = "" })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tok, err := MintHS256(tt.secret, tt.c, testNow); err == nil {
				t.Fatalf("MintHS256 succeeded: %s", tok)
			}
		})
	}
	if _, err := MintEdDSA(edPriv[:10], baseClaims(), testNow); err == nil {
		t.Fatal("MintEdDSA accepted a truncated key")
	}
}

func BenchmarkAuthenticateStatic(b *testing.B) {
	benchAuthenticate(b, newAuth(b, Options{StaticToken: testStatic}), header(testStatic))
}

func BenchmarkAuthenticateHS256(b *testing.B) {
	key := secret('k')
	a := newAuth(b, Options{StaticToken: testStatic, HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	c := baseClaims()
	c.Role = RoleAgent
	c.Agents = []string{"a1"}
	benchAuthenticate(b, a, header(mintHS(b, key, c, testNow)))
}

// benchAuthenticate measures a.Authenticate of the Authorization header h,
// which it must accept.
func benchAuthenticate(b *testing.B, a *Authenticator, h []byte) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Authenticate(h, testNow); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTimeClaimsAndClockSkew: an issuer's clock may run ahead of ours or
// behind by the leeway, no more: a token issued (iat) or valid from (nbf)
// within it is accepted, one further in the future is not. Times must be
// numbers a clock can hold: a nbf of 1e300 is not "long ago", an exp of
// 1e300 not "never".
func TestTimeClaimsAndClockSkew(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	tok := func(k string, v any) []byte {
		return header(signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), k, v)))
	}
	runAuthCases(t, a, []authCase{
		{name: "issued 20s ahead (clock skew within leeway)", header: tok("iat", testNow.Add(20*time.Second).Unix()), wantSub: "alice"},
		{name: "issued 2m ahead", header: tok("iat", testNow.Add(2*time.Minute).Unix()), wantErr: ErrInvalidToken},
		{name: "valid from 2m ahead", header: tok("nbf", testNow.Add(2*time.Minute).Unix()), wantErr: ErrInvalidToken},
		{name: "expired 20s ago (clock skew within leeway)", header: tok("exp", testNow.Add(-20*time.Second).Unix()), wantSub: "alice"},
		{name: "expired 2m ago", header: tok("exp", testNow.Add(-2*time.Minute).Unix()), wantErr: ErrExpiredToken},
		{name: "iat as a string", header: tok("iat", "0"), wantErr: ErrInvalidToken},
		{name: "nbf far past the last year a clock holds", header: tok("nbf", 1e300), wantErr: ErrInvalidToken},
		{name: "exp far past the last year a clock holds", header: tok("exp", 1e300), wantErr: ErrInvalidToken},
		{name: "exp in year 30000", header: tok("exp", 884541340800), wantErr: ErrInvalidToken},
		{name: "exp in year 9999", header: tok("exp", 253402300799), wantSub: "alice"},
		{name: "nbf before year 1", header: tok("nbf", -1e300), wantErr: ErrInvalidToken},
		{name: "sub with a newline", header: tok("sub", "alice\nlevel=ERROR msg=forged"), wantErr: ErrInvalidToken},
		{name: "sub with a bidi override", header: tok("sub", "alice\u202e"), wantErr: ErrInvalidToken},
		{name: "tenant with a NUL", header: tok("tenant", "acme\x00"), wantErr: ErrInvalidToken},
	})
	for _, l := range []time.Duration{5 * time.Minute, time.Second} {
		if _, err := New(Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience, Leeway: l}); err != nil {
			t.Errorf("leeway %v: %v", l, err)
		}
	}
	if _, err := New(Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience, Leeway: 5*time.Minute + time.Second}); err == nil {
		t.Error("a leeway over 5 minutes was accepted")
	}
}
