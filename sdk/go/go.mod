module github.com/getratchet/ratchet/sdk/go

go 1.22
