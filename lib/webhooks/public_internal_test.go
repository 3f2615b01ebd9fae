package webhooks

import (
	"net"
	"testing"
)

func TestPublicRefusesEveryNonPublicRange(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"0.0.0.0", "100.64.0.1", "100.100.100.200", "198.18.0.1", "198.19.255.255", "240.0.0.1",
		"255.255.255.254", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "::ffff:100.100.100.200",
		"64:ff9b::a00:1", "64:ff9b:1::1", "224.0.0.1"} {
		if public(net.ParseIP(s)) {
			t.Errorf("%s is public", s)
		}
	}
	for _, s := range []string{"93.184.216.34", "8.8.8.8", "100.63.255.255", "100.128.0.1", "2606:2800:220:1::1"} {
		if !public(net.ParseIP(s)) {
			t.Errorf("%s is not public", s)
		}
	}
}
