package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"testing"

	"github.com/gatehouse-dev/gatehouse/ident"
)

// FuzzAuthenticate signs arbitrary claims with the configured secret, so
// that the fuzzer reaches the claims parser behind the signature check. A
// principal comes out only with a subject that is an id, a known role and
// a numeric exp in the future that a clock can hold; nothing panics.
func FuzzAuthenticate(f *testing.F) {
	for _, s := range []string{
		`{"sub":"alice","role":"admin","iss":"https://issuer.test","aud":"gatehouse","exp":1748782800}`,
		`{"sub":"alice","role":"admin","iss":"https://issuer.test","aud":"gatehouse","exp":"1748782800"}`,
		`{"sub":"","role":"client","exp":1e999}`,
		`{"sub":"a","role":"agent","agents":["x"],"exp":1748782800.5,"nbf":null}`,
		`[]`, `null`, `{"exp":{}}`,
	} {
		f.Add(`{"alg":"HS256","typ":"JWT"}`, s)
	}
	key := secret('k')
	a, err := New(Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	if err != nil {
		f.Fatal(err)
	}
	enc := base64.RawURLEncoding
	f.Fuzz(func(t *testing.T, header, claims string) {
		unsigned := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(unsigned))
		token := unsigned + "." + enc.EncodeToString(mac.Sum(nil))
		p, err := a.Authenticate([]byte("Bearer "+token), testNow)
		if err != nil {
			return
		}
		if ident.Check("sub", p.Subject) != nil || !p.Role.valid() || !p.ExpiresAt.After(testNow.Add(-DefaultLeeway)) || p.ExpiresAt.Year() > 9999 {
			t.Fatalf("accepted %s as %+v", claims, p)
		}
	})
}
