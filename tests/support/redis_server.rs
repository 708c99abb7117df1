//! Throwaway redis-server processes for tests.
