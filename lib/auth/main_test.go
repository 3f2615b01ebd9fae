package auth_test

import (
	"os"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }
