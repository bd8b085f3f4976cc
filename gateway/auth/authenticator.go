package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/golang-jwt/jwt/v5"
)

// DefaultLeeway is the clock skew tolerated on exp, nbf and iat when
// Options.Leeway is zero.
const DefaultLeeway = 30 * time.Second

// MaxLeeway bounds Options.Leeway: a leeway is for clocks that drift, and
// one of more than a few minutes keeps expired tokens alive.
const MaxLeeway = 5 * time.Minute

// minHMACSecret is the HS256 key size floor from RFC 7518 §3.2: a key
// shorter than the hash output weakens the MAC.
const minHMACSecret = sha256.Size

// minRSABits keeps RS256 keys at the size NIST still accepts.
const minRSABits = 2048

// The signing methods, one per key type. Pinning each key to exactly one
// method is what stops an HS256 token being verified with a public key as
// its "secret".
const (
	algHS256 = "HS256"
	algEdDSA = "EdDSA"
	algRS256 = "RS256"
)

// Options configures an Authenticator. The zero value is open mode.
type Options struct {
	// StaticToken, when set, authenticates as principal "static" with role
	// admin.
	StaticToken string
	// HMACSecrets maps a kid to an HS256 secret of at least 32 bytes. The kid
	// "" names a key used only by tokens without a kid header.
	HMACSecrets map[string][]byte
	// PublicKeyFiles maps a kid to a PEM file holding an Ed25519 or RSA public
	// key; the key type decides whether it verifies EdDSA or RS256 tokens.
	PublicKeyFiles map[string]string
	// Issuer is the required iss of every JWT.
	Issuer string
	// Audience must appear in the aud of every JWT.
	Audience string
	// Leeway is the tolerated clock skew; zero means DefaultLeeway.
	Leeway time.Duration
}

// Authenticator checks request credentials. It is immutable after New and
// safe for concurrent use.
type Authenticator struct {
	open      bool
	hasStatic bool
	// staticSum is compared instead of the token itself so that the
	// comparison's duration does not depend on the presented token's length.
	staticSum [sha256.Size]byte

	hasJWT bool
	// byKid resolves tokens that name their key.
	byKid map[string]verifier
	// byAlg holds, per method, either the single key or a
	// jwt.VerificationKeySet, already boxed so the key lookup does not
	// allocate.
	byAlg   map[string]any
	keyfunc jwt.Keyfunc
	// parsers recycles *clockedParser values: a jwt.Parser bakes its clock in
	// at construction, and building one per request would cost several
	// allocations on the hot path.
	parsers sync.Pool

	// openCaller and staticCaller are the principals of open mode and of
	// the static token, the same for every request: Principals are
	// read-only once returned, so one made at New serves them all without
	// an allocation per request.
	openCaller, staticCaller *Principal
}

type verifier struct {
	alg string
	key any
}

// clockedParser is a jwt.Parser whose clock reads the time passed to
// Authenticate. It is used by one request at a time via the pool.
type clockedParser struct {
	now    time.Time
	parser *jwt.Parser
}

func (c *clockedParser) clock() time.Time { return c.now }

// tokenClaims is the JWT payload this gateway understands.
type tokenClaims struct {
	jwt.RegisteredClaims
	Role    Role     `json:"role"`
	Agents  []string `json:"agents,omitempty"`
	Runners []string `json:"runners,omitempty"`
	// Tools is kept apart from empty: a claim of no patterns allows no
	// tool, a missing claim leaves the role's default (see MayServe).
	Tools    []string `json:"tools,omitzero"`
	Sessions []string `json:"sessions,omitempty"`
	Tenant   string   `json:"tenant,omitempty"`
}

// The range of a time claim: years 1 to 9999, what a time.Time formats
// and an int64 of seconds holds. The JWT library converts a float to
// int64 seconds unchecked, so a nbf of 1e300 came out long ago, and valid.
const (
	minNumericDate = -62135596800 // 0001-01-01T00:00:00Z
	maxNumericDate = 253402300799 // 9999-12-31T23:59:59Z
)

// UnmarshalJSON decodes the claims, refusing times that are not JSON
// numbers: RFC 7519 says NumericDate, and the JWT library would take a
// quoted "exp" as well, which other verifiers of the same token may not.
// A time out of years 1 to 9999 is refused too.
func (c *tokenClaims) UnmarshalJSON(b []byte) error {
	var times struct {
		Exp, Nbf, Iat json.RawMessage
	}
	if err := json.Unmarshal(b, &times); err != nil {
		return err
	}
	for name, raw := range map[string]json.RawMessage{"exp": times.Exp, "nbf": times.Nbf, "iat": times.Iat} {
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
			return fmt.Errorf("claim %s must be a number", name)
		}
		if f, err := strconv.ParseFloat(string(raw), 64); err != nil || f < minNumericDate || f > maxNumericDate {
			return fmt.Errorf("claim %s must be a time within years 1 to 9999", name)
		}
	}
	type plain tokenClaims
	return json.Unmarshal(b, (*plain)(c))
}

// New validates o, loads and parses every key once, and returns an
// Authenticator. It fails on unreadable or unsupported key files, weak keys,
// a kid used twice, JWT keys without Issuer or Audience, and Issuer or
// Audience without JWT keys (which would otherwise leave the gateway open
// while looking configured).
func New(o Options) (*Authenticator, error) {
	if o.Leeway < 0 || o.Leeway > MaxLeeway {
		return nil, fmt.Errorf("auth: leeway %v: it must be between 0 and %v", o.Leeway, MaxLeeway)
	}
	a := &Authenticator{
		byKid:        make(map[string]verifier),
		byAlg:        make(map[string]any),
		openCaller:   &Principal{Subject: openSubject, Role: RoleAdmin},
		staticCaller: &Principal{Subject: staticSubject, Role: RoleAdmin},
	}
	if o.StaticToken != "" {
		if !visibleASCII(o.StaticToken) {
			return nil, errors.New("auth: static token must be printable ASCII without spaces")
		}
		a.hasStatic = true
		a.staticSum = sha256.Sum256([]byte(o.StaticToken))
	}

	groups := make(map[string][]jwt.VerificationKey)
	add := func(kid string, v verifier) error {
		if _, dup := a.byKid[kid]; dup {
			return fmt.Errorf("auth: kid %q configured twice", kid)
		}
		a.byKid[kid] = v
		groups[v.alg] = append(groups[v.alg], v.key)
		return nil
	}
	// Sorted so that errors and the order keys are tried in do not depend on
	// map iteration.
	for _, kid := range slices.Sorted(maps.Keys(o.HMACSecrets)) {
		secret := o.HMACSecrets[kid]
		if len(secret) < minHMACSecret {
			return nil, fmt.Errorf("auth: HMAC secret %q is %d bytes, need at least %d", kid, len(secret), minHMACSecret)
		}
		if err := add(kid, verifier{alg: algHS256, key: bytes.Clone(secret)}); err != nil {
			return nil, err
		}
	}
	for _, kid := range slices.Sorted(maps.Keys(o.PublicKeyFiles)) {
		v, err := loadPublicKey(o.PublicKeyFiles[kid])
		if err != nil {
			return nil, fmt.Errorf("auth: public key %q: %w", kid, err)
		}
		if err := add(kid, v); err != nil {
			return nil, err
		}
	}
	// The "" kid is reachable only through byAlg: a token with an empty kid
	// header is treated as having none.
	delete(a.byKid, "")

	a.hasJWT = len(groups) > 0
	a.open = !a.hasStatic && !a.hasJWT
	switch {
	case !a.hasJWT && (o.Issuer != "" || o.Audience != ""):
		return nil, errors.New("auth: issuer or audience set but no JWT keys configured")
	case a.hasJWT && (o.Issuer == "" || o.Audience == ""):
		return nil, errors.New("auth: JWT keys require both issuer and audience")
	}
	if !a.hasJWT {
		return a, nil
	}

	methods := make([]string, 0, len(groups))
	for alg, keys := range groups {
		methods = append(methods, alg)
		if len(keys) == 1 {
			a.byAlg[alg] = keys[0]
			continue
		}
		a.byAlg[alg] = jwt.VerificationKeySet{Keys: keys}
	}
	leeway := o.Leeway
	if leeway == 0 {
		leeway = DefaultLeeway
	}
	a.keyfunc = a.lookupKey
	a.parsers.New = func() any {
		c := &clockedParser{}
		c.parser = jwt.NewParser(
			jwt.WithValidMethods(methods),
			jwt.WithExpirationRequired(),
			// A token issued in our future, past the leeway, comes from a
			// clock that is wrong or a minter that lies.
			jwt.WithIssuedAt(),
			jwt.WithAudience(o.Audience),
			jwt.WithIssuer(o.Issuer),
			jwt.WithLeeway(leeway),
			jwt.WithTimeFunc(c.clock),
		)
		return c
	}
	return a, nil
}

// Open reports whether no credential is configured, in which case every
// request is the local admin.
func (a *Authenticator) Open() bool { return a.open }

// The subjects of the admins the configuration makes.
const (
	openSubject   = "local"
	staticSubject = "static"
)

// SoleSubject is the subject every caller has when the credentials make
// only one principal: "local" in open mode, "static" with a static token
// and no JWT keys. It is empty when JWTs may name several.
func (a *Authenticator) SoleSubject() string {
	switch {
	case a.open:
		return openSubject
	case a.hasStatic && !a.hasJWT:
		return staticSubject
	}
	return ""
}

// Authenticate checks the raw Authorization header value at time now. In
// open mode the header is ignored. Otherwise it must be exactly
// "Bearer <token>" — scheme case-sensitive, one space, a non-empty token of
// printable ASCII — matching the header format existing clients send. The
// token is tried as the static token first, then as a JWT. A JWT's kid
// header selects that key, which must be for the token's method; without a
// kid every key of the token's method is tried.
func (a *Authenticator) Authenticate(authorization []byte, now time.Time) (*Principal, error) {
	if a.open {
		return a.openCaller, nil
	}
	token, err := bearer(authorization)
	if err != nil {
		return nil, err
	}
	if a.hasStatic {
		sum := sha256.Sum256(token)
		if subtle.ConstantTimeCompare(sum[:], a.staticSum[:]) == 1 {
			return a.staticCaller, nil
		}
	}
	if !a.hasJWT {
		return nil, fmt.Errorf("%w: token not recognised", ErrInvalidToken)
	}
	return a.parseJWT(string(token), now)
}

func (a *Authenticator) parseJWT(token string, now time.Time) (*Principal, error) {
	c := a.parsers.Get().(*clockedParser)
	c.now = now
	var claims tokenClaims
	_, err := c.parser.ParseWithClaims(token, &claims, a.keyfunc)
	a.parsers.Put(c)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, fmt.Errorf("%w: %w", ErrExpiredToken, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	case claims.Subject == "":
		return nil, fmt.Errorf("%w: missing sub", ErrInvalidToken)
	case !claims.Role.valid():
		return nil, fmt.Errorf("%w: unknown role %q", ErrInvalidToken, claims.Role)
	}
	// The subject and tenant own what the token creates: they are written
	// into events, logs and store keys like any id.
	if err := ident.Check("sub", claims.Subject); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if claims.Tenant != "" {
		if err := ident.Check("tenant", claims.Tenant); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidToken, err)
		}
	}
	if err := checkToolPatterns(claims.Tools); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	return &Principal{
		Subject:   claims.Subject,
		Role:      claims.Role,
		Agents:    claims.Agents,
		Runners:   claims.Runners,
		Tools:     claims.Tools,
		Sessions:  claims.Sessions,
		Tenant:    claims.Tenant,
		ExpiresAt: claims.ExpiresAt.Time,
	}, nil
}

// lookupKey picks the verification key for t. The parser has already
// rejected methods that no configured key uses; this additionally refuses a
// kid whose key belongs to another method.
func (a *Authenticator) lookupKey(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	if kid, _ := t.Header["kid"].(string); kid != "" {
		v, ok := a.byKid[kid]
		if !ok {
			return nil, fmt.Errorf("unknown kid %q", kid)
		}
		if v.alg != alg {
			return nil, fmt.Errorf("kid %q is a %s key, token is %s", kid, v.alg, alg)
		}
		return v.key, nil
	}
	if key, ok := a.byAlg[alg]; ok {
		return key, nil
	}
	return nil, fmt.Errorf("no %s key configured", alg)
}

const bearerPrefix = "Bearer "

// bearer extracts the token from an Authorization header value.
func bearer(h []byte) ([]byte, error) {
	if len(h) == 0 {
		return nil, ErrMissingToken
	}
	if len(h) < len(bearerPrefix) || string(h[:len(bearerPrefix)]) != bearerPrefix {
		return nil, fmt.Errorf("%w: want \"Bearer <token>\"", ErrMalformed)
	}
	token := h[len(bearerPrefix):]
	if len(token) == 0 {
		return nil, fmt.Errorf("%w: empty token", ErrMalformed)
	}
	if !visibleASCII(token) {
		return nil, fmt.Errorf("%w: token must be printable ASCII without spaces", ErrMalformed)
	}
	return token, nil
}

func visibleASCII[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// loadPublicKey reads a single PEM-encoded public key (PKIX "PUBLIC KEY" or
// PKCS#1 "RSA PUBLIC KEY") and pins it to the method its type implies.
func loadPublicKey(path string) (verifier, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return verifier{}, err
	}
	block, rest := pem.Decode(data)
	if block == nil {
		return verifier{}, fmt.Errorf("%s: no PEM block", path)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return verifier{}, fmt.Errorf("%s: trailing data after the first PEM block", path)
	}
	var pub any
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	default:
		return verifier{}, fmt.Errorf("%s: PEM block %q is not a public key", path, block.Type)
	}
	if err != nil {
		return verifier{}, fmt.Errorf("%s: %w", path, err)
	}
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return verifier{alg: algEdDSA, key: k}, nil
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return verifier{}, fmt.Errorf("%s: RSA key is %d bits, need at least %d", path, k.N.BitLen(), minRSABits)
		}
		return verifier{alg: algRS256, key: k}, nil
	default:
		return verifier{}, fmt.Errorf("%s: unsupported public key type %T", path, pub)
	}
}
