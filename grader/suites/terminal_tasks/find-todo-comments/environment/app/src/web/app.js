// Entry point
function start() {
  // TODO wire up the router
  console.log("TODOS are listed elsewhere");
}
start();
