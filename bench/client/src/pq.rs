//! A blocking PostgreSQL connection over libpq, the C client pgbench and
//! psql use: the lightest client there is for the protocol, so that the
//! end-to-end rows spend as little of the 2 cores as possible on the client
//! side. Only what the bench needs: prepared statements with text
//! parameters, simple queries, one row of text results, the SQLSTATE of an
//! error. Links against the system libpq (libpq-dev, which
//! postgresql-server-dev-15 pulls in).

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_uint};
use std::ptr;

#[repr(C)]
struct PGconn {
    _private: [u8; 0],
}
#[repr(C)]
struct PGresult {
    _private: [u8; 0],
}

const CONNECTION_OK: c_int = 0;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;
const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;

#[link(name = "pq")]
extern "C" {
    fn PQconnectdb(conninfo: *const c_char) -> *mut PGconn;
    fn PQstatus(conn: *const PGconn) -> c_int;
    fn PQerrorMessage(conn: *const PGconn) -> *const c_char;
    fn PQfinish(conn: *mut PGconn);
    fn PQprepare(
        conn: *mut PGconn,
        name: *const c_char,
        query: *const c_char,
        n_params: c_int,
        param_types: *const c_uint,
    ) -> *mut PGresult;
    fn PQexecPrepared(
        conn: *mut PGconn,
        name: *const c_char,
        n_params: c_int,
        values: *const *const c_char,
        lengths: *const c_int,
        formats: *const c_int,
        result_format: c_int,
    ) -> *mut PGresult;
    fn PQexec(conn: *mut PGconn, query: *const c_char) -> *mut PGresult;
    fn PQresultStatus(res: *const PGresult) -> c_int;
    fn PQresultErrorMessage(res: *const PGresult) -> *const c_char;
    fn PQresultErrorField(res: *const PGresult, field: c_int) -> *const c_char;
    fn PQntuples(res: *const PGresult) -> c_int;
    fn PQnfields(res: *const PGresult) -> c_int;
    fn PQgetisnull(res: *const PGresult, row: c_int, col: c_int) -> c_int;
    fn PQgetvalue(res: *const PGresult, row: c_int, col: c_int) -> *const c_char;
    fn PQcmdTuples(res: *mut PGresult) -> *const c_char;
    fn PQclear(res: *mut PGresult);
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libpq returns NUL-terminated strings that live as long as
        // the result or connection they came from; we copy at once.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().trim_end().to_string()
    }
}

/// A failed statement: its SQLSTATE (empty if the connection broke) and message.
#[derive(Debug)]
pub struct PgError {
    pub sqlstate: String,
    pub message: String,
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({})",
            self.message,
            if self.sqlstate.is_empty() { "no SQLSTATE" } else { &self.sqlstate }
        )
    }
}

impl std::error::Error for PgError {}

/// One result: the first row's text values and the affected row count.
pub struct Row {
    values: Vec<Option<String>>,
    pub affected: u64,
}

impl Row {
    /// Column `i` of the first row, None if NULL or there is no row.
    pub fn get(&self, i: usize) -> Option<&str> {
        self.values.get(i).and_then(|v| v.as_deref())
    }

    pub fn i64(&self, i: usize) -> Result<Option<i64>, PgError> {
        self.get(i)
            .map(|v| {
                v.parse()
                    .map_err(|_| PgError { sqlstate: String::new(), message: format!("not an integer: {v}") })
            })
            .transpose()
    }

    pub fn bool(&self, i: usize) -> Option<bool> {
        self.get(i).map(|v| v == "t")
    }
}

pub struct Pg {
    conn: *mut PGconn,
}

// SAFETY: a connection is used by one thread at a time (each worker owns its
// own); libpq is thread-safe across distinct connections.
unsafe impl Send for Pg {}

impl Pg {
    pub fn connect(dsn: &str) -> Result<Pg, PgError> {
        let c = CString::new(dsn)
            .map_err(|_| PgError { sqlstate: String::new(), message: "NUL in dsn".into() })?;
        // SAFETY: c is a valid C string; the connection is freed in Drop.
        let conn = unsafe { PQconnectdb(c.as_ptr()) };
        let pg = Pg { conn };
        // SAFETY: conn is what PQconnectdb returned (never NULL but for OOM, checked).
        if conn.is_null() || unsafe { PQstatus(conn) } != CONNECTION_OK {
            let message =
                if conn.is_null() { "out of memory".into() } else { text(unsafe { PQerrorMessage(conn) }) };
            return Err(PgError { sqlstate: String::new(), message });
        }
        Ok(pg)
    }

    fn take(&self, res: *mut PGresult) -> Result<Row, PgError> {
        if res.is_null() {
            // SAFETY: a live connection.
            return Err(PgError {
                sqlstate: String::new(),
                message: text(unsafe { PQerrorMessage(self.conn) }),
            });
        }
        // SAFETY: res is a result of this connection, cleared before return.
        unsafe {
            let st = PQresultStatus(res);
            let out = if st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK {
                let rows = PQntuples(res) as usize;
                let values = if rows > 0 {
                    (0..PQnfields(res))
                        .map(|i| {
                            if PQgetisnull(res, 0, i) != 0 {
                                None
                            } else {
                                Some(text(PQgetvalue(res, 0, i)))
                            }
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Ok(Row { values, affected: text(PQcmdTuples(res)).parse().unwrap_or(0) })
            } else {
                Err(PgError {
                    sqlstate: text(PQresultErrorField(res, PG_DIAG_SQLSTATE)),
                    message: text(PQresultErrorMessage(res)),
                })
            };
            PQclear(res);
            out
        }
    }

    /// Prepare `sql` as statement `name`, parameter types left to the server.
    pub fn prepare(&mut self, name: &str, sql: &str) -> Result<(), PgError> {
        let (n, q) = (CString::new(name).unwrap(), CString::new(sql).unwrap());
        // SAFETY: valid C strings; a live connection.
        let res = unsafe { PQprepare(self.conn, n.as_ptr(), q.as_ptr(), 0, ptr::null()) };
        self.take(res).map(|_| ())
    }

    /// Execute prepared statement `name` with text parameters (None = NULL).
    pub fn exec(&mut self, name: &str, params: &[Option<&str>]) -> Result<Row, PgError> {
        let n = CString::new(name).unwrap();
        let owned: Vec<Option<CString>> =
            params.iter().map(|p| p.map(|s| CString::new(s).unwrap())).collect();
        let ptrs: Vec<*const c_char> =
            owned.iter().map(|p| p.as_ref().map_or(ptr::null(), |c| c.as_ptr())).collect();
        // SAFETY: ptrs point into `owned`, alive for the call; text format.
        let res = unsafe {
            PQexecPrepared(
                self.conn,
                n.as_ptr(),
                ptrs.len() as c_int,
                ptrs.as_ptr(),
                ptr::null(),
                ptr::null(),
                0,
            )
        };
        self.take(res)
    }

    /// A simple query (BEGIN, COMMIT, SET ...).
    pub fn simple(&mut self, sql: &str) -> Result<Row, PgError> {
        let q = CString::new(sql).unwrap();
        // SAFETY: a valid C string; a live connection.
        let res = unsafe { PQexec(self.conn, q.as_ptr()) };
        self.take(res)
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        if !self.conn.is_null() {
            // SAFETY: the connection this value owns, freed once.
            unsafe { PQfinish(self.conn) };
        }
    }
}
