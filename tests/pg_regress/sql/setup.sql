-- Install the extension; every later file uses it.
CREATE EXTENSION fenced_lock;
\dx fenced_lock
